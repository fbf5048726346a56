"""Optional plots for the benchmarks: matplotlib is not a dependency of inagg, so a benchmark
without it still writes its CSV and says once why there is no PNG."""

from __future__ import annotations


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend, or None (with a note) when
    matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
