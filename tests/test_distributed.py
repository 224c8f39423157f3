"""Several processes: the user guide's multi-host recipe run by two JAX
processes on this machine (``distributed_worker.py``), each with two host
devices and its own rows of the data."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("distributed_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.xdist_group("two_processes")
def test_two_processes_compute_the_single_process_loss_and_gradient():
    port = str(_free_port())
    runs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(i), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [run.communicate(timeout=600) for run in runs]
    for run, (_, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err[-4000:]
    result = json.loads(outputs[0][0].strip().splitlines()[-1])
    assert result["process_count"] == 2 and result["device_count"] == 4
    # the global arrays hold every process's rows, in order, over 4 devices
    assert result["assembled"] and result["sharded_over"] == 4
    for name in ("pvi-log", "pvi-crps", "pacm", "softcvi"):
        assert result[name] < 1e-5, (name, result[name])
