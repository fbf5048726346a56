"""One rank of a job as its own process, for tests that kill ranks or restart parts under a
running job: ``python tests/rank_process.py STORE RANK N CONTROLLER BIND_IP CALLS [VALUE [BYTES]]``.

It allreduces ``torch.full((1000,), VALUE)`` (VALUE: 1 unless given) CALLS times (0: until an
error), checks every result is exactly N * VALUE (BYTES: the bytes per iteration its job declares, 0 unless given), and prints one line per event on stdout: ``ready``, ``ok I`` every 10 calls,
``done`` or ``error TIME TYPE: MESSAGE`` (also when the communicator cannot be made) (TIME: time.time() when the error was raised)."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from inagg.hostlib.worker.communicator import Communicator  # noqa: E402


def main() -> int:
    store_path, rank, n, controller, bind_ip, calls = sys.argv[1:7]
    rank, n, calls = int(rank), int(n), int(calls)
    value = float(sys.argv[7]) if len(sys.argv) > 7 else 1.0
    declared = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    try:
        comm = Communicator(dist.FileStore(store_path, n), rank, n, controller, bind_ip=bind_ip,
                            stall_timeout=120.0, bytes_per_iteration=declared)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(f"error {time.time():.3f} {type(e).__name__}: {e}", flush=True)
        return 1
    print("ready", flush=True)
    i = 0
    while not calls or i < calls:
        try:
            out = comm.allreduce(torch.full((1000,), value))
        except Exception as e:  # noqa: BLE001 - reported to the test
            print(f"error {time.time():.3f} {type(e).__name__}: {e}", flush=True)
            return 1
        if out.tolist() != [n * value] * 1000:
            print(f"error {time.time():.3f} WrongResult: call {i}: {out[:4].tolist()}...", flush=True)
            return 1
        i += 1
        if i % 10 == 0:
            print(f"ok {i}", flush=True)
        time.sleep(0.005)
    print("done", flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
