"""A rank's account of its grants and call times (``inagg.hostlib.worker.call_log``), which the
emulation's summary tells as each job's story."""

from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.worker import call_log
from inagg.hostlib.worker.call_log import CallLog


def test_each_grant_gets_the_calls_made_under_it_and_their_median(monkeypatch):
    """Per grant: the first call under it, how many calls and their median; with more calls
    than are kept, medians come from those still kept."""
    monkeypatch.setattr(call_log, "CALLS_KEPT", 4)
    log = CallLog()
    log.use(Grant(7, 1, 0, 32, 64, ("10.0.0.100", 42666), reason="no room"))
    for seconds in (0.010, 0.030, 0.020):
        log.call(seconds)
    log.use(Grant(7, 2, 0, 64, 64, ("10.0.0.254", 42602), mode="switch"))
    for seconds in (0.001, 0.003, 0.002):
        log.call(seconds)
    story = log.story()
    assert [(g["mode"], g["from_call"], g["calls"], g["reason"]) for g in story] == \
        [("host", 0, 3, "no room"), ("switch", 3, 3, "")]
    assert story[0]["aggregator"] == "10.0.0.100:42666" and story[1]["slots"] == "[0,64)"
    assert story[0]["median_ms"] == 20.0       # its calls 0 and 1 are no longer kept
    assert story[1]["median_ms"] == 2.0 and log.median_ms() == 2.5   # kept: 20, 1, 3, 2 ms
    assert CallLog().median_ms() is None
