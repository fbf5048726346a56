"""benchmarks/fig_tree.py (``make fig-tree``) in its smallest form, as tests/test_figures.py runs
the others (one repetition, the load check set to mark; needs root and Mininet). A file of its
own so pytest-xdist's ``--dist loadfile`` can run it on another worker than the other figures."""

from test_figures import emulation, run_figure, spread_ok


def test_fig_tree_compares_at_equal_windows(tmp_path):
    emulation()
    rows, _ = run_figure(tmp_path, "fig_tree", "--sizes-mib", "0.25")
    flat, tree = rows
    assert (flat["job"], tree["job"]) == ("flat", "tree") and flat["window"] == tree["window"]
    assert tree["same_bits"] == "True" and spread_ok(tree, "ratio") and spread_ok(flat, "seconds")
