"""The host path on a real 1500-byte link (two network namespaces joined by a veth pair): the
aggregator derives K from its interface's MTU, an allreduce at that K is exact, and a grant
whose datagrams would need IP fragmentation fails with a clear error instead of fragmenting."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from inagg.bmv2_env.emulation.testbed import have_netns, in_netns, sh
from inagg.hostlib.wire.grant import Grant, values_for_mtu
from inagg.hostlib.worker.stream_reference import SlotStream
from inagg.hostlib.wire.transport import UdpTransport

AGG_IP, WORKER_IP = "10.77.0.1", "10.77.0.2"


@pytest.fixture
def link():
    """Namespaces ``agg`` and ``workers`` of this test, joined by one 1500-byte veth link."""
    if have_netns():
        pytest.skip(have_netns())
    agg, workers = f"inaggmtu{os.getpid()}a", f"inaggmtu{os.getpid()}w"
    sh("ip", "netns", "add", agg)
    try:
        sh("ip", "netns", "add", workers)
        sh("ip", "-n", agg, "link", "add", "va", "mtu", "1500", "type", "veth", "peer", "name", "vw",
           "netns", workers)
        for ns, dev, ip in ((agg, "va", AGG_IP), (workers, "vw", WORKER_IP)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        yield agg, workers
    finally:
        for ns in (agg, workers):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_host_path_fits_a_1500_byte_link(link):
    agg_ns, workers_ns = link
    k = values_for_mtu(1500)
    with in_netns(workers_ns):
        transports = [UdpTransport((AGG_IP, 1), bind=(WORKER_IP, 0)) for _ in range(2)]
    job = {"job_id": 1, "slot_base": 0, "slot_count": 8,
           "workers": ["%s:%d" % t.address for t in transports]}
    agg = subprocess.Popen(["ip", "netns", "exec", agg_ns, sys.executable, "-m", "inagg.hostlib.aggregator.server",
                            "--bind", f"{AGG_IP}:0", "--slots", "8", "--job", json.dumps(job)],
                           stdout=subprocess.PIPE, text=True)
    try:
        line = agg.stdout.readline()
        assert f"K = {k}" in line, line
        address = (AGG_IP, int(line.split()[3].rsplit(":", 1)[1]))
        for t in transports:
            t.retarget(address)
        grant = Grant(1, 1, 0, 8, k, address)
        streams = [SlotStream(grant, r, 2, t) for r, t in enumerate(transports)]
        xs = [np.arange(5000, dtype=np.float32) * (r + 1) for r in range(2)]
        errors = []
        threads = [threading.Thread(target=lambda s=s, x=x: _call(s, x, errors))
                   for s, x in zip(streams, xs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [] and np.array_equal(xs[0], np.arange(5000, dtype=np.float32) * 3)

        too_large = SlotStream(Grant(1, 1, 0, 8, k + 1, address), 0, 2, transports[0])
        with pytest.raises(ValueError, match="never fragmented"):
            too_large.allreduce(np.ones(10, np.float32))
    finally:
        agg.terminate()
        report = json.loads(agg.communicate(timeout=10)[0])
        for t in transports:
            t.close()
    assert report["jobs"]["1"]["results"] > 0 and report["send_errors"] == 0


def _call(stream, x, errors):
    try:
        stream.allreduce(x)
    except Exception as e:  # noqa: BLE001 - reported by the test
        errors.append(e)
