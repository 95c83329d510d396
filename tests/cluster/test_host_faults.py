"""Faults of a host, on a standalone cluster across simulated hosts (:mod:`irbis.spark.hosts`): what must
hold when a host dies.

A scoring job runs on two hosts (a worker of one core on each); once a few of its tasks have started, host 1
dies (every process on it killed, its link down). The job must end with every input row scored exactly once
and each score right. The driver is ``host_faults.py``, a process of its own.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from irbis.spark import hosts as simulated
from irbis.spark.hosts import SimulatedHosts
from irbis.spark.standalone import kill_group, process_env, start_standalone
from jvm_options import with_test_jvm_options

WHY = simulated.unavailable()
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.skipif(WHY is not None, reason=WHY or "")]
DRIVER = Path(__file__).resolve().parent / "host_faults.py"


def test_a_host_that_dies_mid_job_loses_no_row_and_scores_none_twice(tmp_path):
    import pandas as pd

    sys.path.insert(0, str(DRIVER.parent))
    from host_faults import PARTITIONS, WEIGHTS, features

    rows, out = 480, tmp_path / "out"
    with SimulatedHosts(2) as hosts, \
            start_standalone(tmp_path / "cluster", workers=2, cores=1, memory="1g", hosts=hosts) as cluster:
        env = with_test_jvm_options(process_env(tmp_path / "driver", hosts.driver_address))
        with open(tmp_path / "driver.log", "wb") as log:
            driver = subprocess.Popen([sys.executable, str(DRIVER), "--master", cluster.url, "--driver-host",
                                       hosts.driver_address, "--out", str(out), "--rows", str(rows)],
                                      env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and len(list((out / "started").glob("*"))) < 3:
                assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
                time.sleep(0.2)
            started = len(list((out / "started").glob("*")))
            assert started >= 3, "the job's tasks did not start:\n" + cluster.logs()
            hosts.kill(1)
            driver.wait(300)
        finally:
            kill_group(driver, grace_s=2.0)
        log = (tmp_path / "driver.log").read_text(errors="replace")
        assert driver.returncode == 0 and (out / "done").exists(), log[-4000:] + cluster.logs()

    attempts = [p.name.split("-") for p in (out / "started").glob("*")]
    print(f"{started} tasks had started when host 1 died; attempts: {sorted(attempts)}")
    assert started < PARTITIONS  # the host died while the job ran
    assert any(int(attempt) > 0 for _, attempt in attempts) or len(attempts) > PARTITIONS, \
        "no task ran again: the dead host had nothing left to lose"
    scores = pd.read_parquet(out / "scores").sort_values("id")
    assert len(scores) == rows and scores["id"].tolist() == list(range(rows))  # each row once, none lost
    expected = features(np.arange(rows)) @ WEIGHTS.T
    got = np.stack([np.asarray(vector["values"]) for vector in scores["score"]])  # a Spark ML vector as Parquet
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
