"""Path choice: which path (switch, host aggregator, fixed point over gloo) carries each call. The
chooser (choice) and its parts: link figures (links), the cost model's options (options, cost),
exploration and confirmation of a better path (explore, confirm), timings and the schedule of
rechecks (timings, schedule), and the sizes the backend's calibration times (calibration)."""
