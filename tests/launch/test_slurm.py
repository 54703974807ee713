"""rankwise under a real Slurm cluster of two nodes on this machine.

scripts/local_slurm.sh starts it: two network namespaces (rw-slurm0, rw-slurm1) on a bridge, munged
and slurmctld in the root namespace, one slurmd per node.  Jobs are submitted from here with
SLURM_CONF set; the nodes share this filesystem, so a job runs the venv's python and rankwise from
/work/main.  Each job has a time limit and each wait a timeout: a hang fails the test with what it
printed, and its job is cancelled.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankwise.checkpoint import read_weights
from rankwise.data.prepare import PreparedData
from rankwise.errors import FAILED
from rankwise.measure.tolerance import max_param_diff
from tests.support.cli import LAUNCH_VARIABLES, ROOT, command_env, rankwise, tiny_text

pytestmark = pytest.mark.slurm  # a real Slurm cluster on this machine (installs slurm-wlm as root)

CLUSTER = ROOT / "scripts" / "local_slurm.sh"
PROBE = "tests/support/launch/slurm_probe.py"
NODES = {"rw-slurm0": "10.213.9.1", "rw-slurm1": "10.213.9.2"}
JOB = (
    *tiny_text(),
    "--strategy",
    "ddp",
    "--max-steps",
    "6",
    "--batch-size",
    "16",
    "--seed",
    "5",
    "--no-progress",
    "--json",
    "--set",
    "launch.timeout_s=20",
)  # 20 s: a node that fails does not stall the other


def _cluster(command: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLUSTER), command], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def slurm_env():
    """The environment a job is submitted with, while the cluster runs; `down` always follows."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("the Slurm cluster needs root and iproute2 (network namespaces, daemons)")
    if shutil.which("slurmd") is None and os.environ.get("RANKWISE_TEST_INSTALL") != "1":
        pytest.skip(
            "Slurm is not installed here; `make test` (RANKWISE_TEST_INSTALL=1) installs "
            "slurm-wlm and munge with apt-get, nothing else does"
        )
    try:
        up = _cluster("up", timeout=600)  # installs slurm-wlm and munge first on a fresh machine
        # a broken cluster is a failure, with the daemons' logs, never a skip
        if up.returncode != 0:
            pytest.fail(
                "scripts/local_slurm.sh up failed "
                f"({up.returncode}):\n{up.stdout}\n{up.stderr[-8000:]}"
            )
        conf = up.stdout.strip().splitlines()[-1].removeprefix("export SLURM_CONF=")
        env = {k: v for k, v in command_env(LAUNCH_VARIABLES).items() if not k.startswith("SLURM_")}
        # The venv's python and rankwise first on PATH: sbatch and srun hand this environment to the
        # tasks.
        env.update(
            SLURM_CONF=conf, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        )
        yield env
    finally:
        down = _cluster("down", timeout=120)
        assert down.returncode == 0, down.stderr


@pytest.fixture(autouse=True)
def cluster_alive(slurm_env):
    """Each test starts on a whole cluster: a daemon that died since (a CI run once lost munged
    mid-module, its socket gone, and the next job never started) is brought back with `up`, saying
    so."""
    status = _cluster("status", timeout=60)
    if "not running" in status.stdout or "no namespace" in status.stdout:
        print(
            "the cluster had lost a part; starting it "
            f"again:\n{status.stdout}\n{status.stderr[-2000:]}"
        )
        up = _cluster("up", timeout=300)
        assert up.returncode == 0, (
            f"scripts/local_slurm.sh up failed ({up.returncode}):\n{up.stderr[-8000:]}"
        )


def _srun(env: dict, *args: str, timeout: float = 200) -> subprocess.CompletedProcess:
    """``srun ARGS`` from this (the controller's) namespace; --immediate: a busy cluster fails,
    never queues.  A job still running after ``timeout`` s is cancelled and the test fails with all
    it printed: a hang never holds the nodes for the next test (whose --immediate would then fail
    too)."""
    name = _job_name()
    srun = subprocess.Popen(
        ["srun", "--time=3", "--immediate=10", f"--job-name={name}", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = srun.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _cancel(env, name)
        stdout, stderr = srun.communicate(timeout=60)
        pytest.fail(
            f"srun {' '.join(args)} still ran after {timeout:.0f} s; cancelled. It "
            f"printed:\n{stdout}\n{stderr[-6000:]}"
        )
    return subprocess.CompletedProcess(srun.args, srun.returncode, stdout, stderr)


def _job_name() -> str:
    """A name no other job of this session has: what :func:`_cancel` finds the job by."""
    return f"rankwise-test-{os.getpid()}-{time.monotonic_ns()}"


def _cancel(env: dict, name: str) -> None:
    """Cancel the job called ``name`` and wait (up to 60 s) until Slurm has let go of its nodes."""
    subprocess.run(["scancel", f"--name={name}"], env=env, capture_output=True, timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        queued = subprocess.run(
            ["squeue", "--noheader", f"--name={name}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if queued.returncode == 0 and not queued.stdout.strip():
            return
        time.sleep(0.5)


def _per_node(command: str) -> tuple[str, ...]:
    """One task per node running ``command`` (a shell line, may use $SLURM_* of its node)."""
    return ("-N2", "--ntasks-per-node=1", "bash", "-c", command)


def _seen(stdout: str) -> list[dict]:
    """The probe's JSON lines, by rank."""
    return sorted(
        (json.loads(line) for line in stdout.splitlines() if line.startswith("{")),
        key=lambda s: s["rank"],
    )


def test_the_sbatch_example_trains_two_nodes_like_one_host(slurm_env, tmp_path):
    """examples/slurm.sbatch, unchanged: 2 nodes x 1 worker, on CPU (no GPU request, 1 CPU a
    task)."""
    out, log = tmp_path / "run", tmp_path / "job.out"
    env = {
        **slurm_env,
        "NPROC_PER_NODE": "1",
        "RANKWISE_OUT": str(out),
        "RANKWISE_ARGS": " ".join(JOB),
    }
    started = time.monotonic()
    # Command-line options override the #SBATCH lines: no GPUs here ("Invalid generic resource
    # (gres) specification" for --gpus-per-node=4) and fewer CPUs than 16 a task ("More processors
    # requested than permitted").
    name = _job_name()
    try:
        job = subprocess.run(
            [
                "sbatch",
                "--wait",
                "--time=3",
                "--gpus-per-node=0",
                "--cpus-per-task=1",
                f"--job-name={name}",
                f"--output={log}",
                "examples/slurm.sbatch",
            ],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired:
        _cancel(env, name)
        pytest.fail(
            f"the sbatch job still ran after 240 s; cancelled. Its output:\n"
            f"{log.read_text(encoding='utf-8')[-6000:] if log.exists() else '(none)'}"
        )
    text = log.read_text(encoding="utf-8") if log.exists() else ""
    print(f"sbatch --wait: exit {job.returncode} after {time.monotonic() - started:.1f} s")
    assert job.returncode == 0, f"{job.stderr}\n{text[-4000:]}"
    # Both nodes share the run directory (one filesystem): only the node whose workers wrote the
    # result reports it.
    summaries = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert (
        len(summaries) == 1 and "node 1: workers finished; rank 0's report is on the node" in text
    ), text[-4000:]
    summary = summaries[0]
    split = PreparedData.load(out / "data").size(summary["eval_split"])
    assert (summary["world_size"], summary["eval_samples"]) == (2, split)
    one_host = rankwise(
        "train",
        *JOB,
        "--nproc-per-node",
        "2",
        "--out",
        str(tmp_path / "one-host"),
        env=slurm_env,
        timeout=120,
    )
    assert one_host.returncode == 0, one_host.stderr[-3000:]
    difference = max_param_diff(
        read_weights(out / "checkpoints"), read_weights(tmp_path / "one-host" / "checkpoints")
    )
    print(
        f"Slurm 2 nodes x 1: world size 2, {split} evaluated; max |Slurm - one host| = "
        f"{difference:.2e}"
    )
    assert difference < 1e-6


def test_srun_tasks_join_through_rankwise_setup(slurm_env):
    """srun starts the ranks itself; rankwise.setup() reads SLURM_PROCID / SLURM_NTASKS /
    SLURM_JOB_NODELIST."""
    job = _srun(slurm_env, "-N2", "-n2", "python", PROBE)
    assert job.returncode == 0, job.stderr[-3000:]
    seen = _seen(job.stdout)
    assert [(s["rank"], s["world_size"], s["source"], s["sum"]) for s in seen] == [
        (0, 2, "slurm", 3.0),
        (1, 2, "slurm", 3.0),
    ]
    assert [s["host"] for s in seen] == list(NODES)  # one rank on each node
    assert all(s["hosts"] == list(NODES) and s["master"].startswith("rw-slurm0:") for s in seen)


def test_rankwise_launch_as_one_agent_per_node(slurm_env):
    """One task per node, unchanged: `rankwise launch` takes the node layout from Slurm (no --nnodes
    ...)."""
    job = _srun(slurm_env, *_per_node(f"exec rankwise launch --nproc-per-node 2 {PROBE}"))
    assert job.returncode == 0, job.stderr[-3000:]
    seen = _seen(job.stdout)
    assert [(s["rank"], s["local_rank"], s["world_size"], s["sum"]) for s in seen] == [
        (0, 0, 4, 10.0),
        (1, 1, 4, 10.0),
        (2, 0, 4, 10.0),
        (3, 1, 4, 10.0),
    ]
    assert [s["host"] for s in seen] == ["rw-slurm0", "rw-slurm0", "rw-slurm1", "rw-slurm1"]
    assert len({s["master"] for s in seen}) == 1 and seen[0]["master"].startswith("rw-slurm0:")


def test_rankwise_doctor_checks_every_node_of_the_allocation(slurm_env):
    # The default --timeout (60 s): a node whose step starts late (its slurmd busy) still meets the
    # other.
    job = _srun(slurm_env, *_per_node("exec rankwise doctor --nproc-per-node 1"), timeout=200)
    assert job.returncode == 0, f"{job.stdout}\n{job.stderr[-3000:]}"
    for node, address in enumerate(NODES.values()):
        assert f"node {node}: every check passed" in job.stdout, job.stdout
        assert f"node {node} reaches the master over rw-slurmn{node} ({address})" in job.stdout, (
            job.stdout
        )
        assert f"node {node} reached rw-slurm0:" in job.stdout, job.stdout
    assert "2 ranks on gloo" in job.stdout  # the all_reduce across both nodes, measured on node 0


# (up to 150 s for the job to loop, 150 s for Slurm to end it, 120 s to revive the node)
@pytest.mark.timeout(600)
def test_a_node_dying_mid_job_ends_it_naming_the_node(slurm_env, tmp_path):
    """rw-slurm1 loses power: its link goes down, then every process on it (slurmd, slurmstepd, the
    agent and its worker) is SIGKILLed.  The rank on rw-slurm0 gives up after its 4 s collective
    timeout and names the rank and node that never arrived, before Slurm (SlurmdTimeout=6) declares
    the node dead and ends the step."""
    progress, name = tmp_path / "progress", _job_name()
    srun = subprocess.Popen(
        [
            "srun",
            "--time=2",
            "--immediate=10",
            f"--job-name={name}",
            *_per_node(f"exec rankwise launch --nproc-per-node 1 {PROBE} --loop {progress} 4"),
        ],
        env=slurm_env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # (beside another xdist worker's load, slurmd starts steps late)
        deadline = time.monotonic() + 150
        # both ranks all-reduce
        while not (progress.exists() and progress.read_text().count("\n") >= 3):
            # (`finally` cancels its job)
            if time.monotonic() > deadline or srun.poll() is not None:
                srun.kill()
                status = _cluster("status", timeout=60)
                pytest.fail(
                    "the job never looped (srun exit "
                    f"{srun.wait()}):\n{srun.stderr.read()[-6000:]}\n"
                    f"the cluster then:\n{status.stdout}{status.stderr[-2000:]}"
                )
            time.sleep(0.2)
        subprocess.run(
            ["ip", "-n", "rw-slurm1", "link", "set", "rw-slurmn1", "down"], check=True, timeout=10
        )
        victims = subprocess.run(
            ["ip", "netns", "pids", "rw-slurm1"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.split()
        for pid in victims:
            os.kill(int(pid), signal.SIGKILL)
        cut = time.monotonic()
        _, stderr = srun.communicate(timeout=150)
        ended = time.monotonic() - cut
    finally:
        srun.kill()
        srun.wait()
        # the step that lost its node may still be ending: the next test needs both nodes
        _cancel(slurm_env, name)
        revived = _cluster("up", timeout=120)  # the same two nodes again, for whatever runs next
        assert revived.returncode == 0, revived.stderr[-4000:]
    print(
        f"killed {len(victims)} processes on rw-slurm1; srun ended {ended:.1f} s later with "
        f"{srun.returncode}"
    )
    # srun passes on its tasks' highest exit code: rank 0's launcher's 1 (errors.FAILED: a rank
    # failed, named below) when its 4 s collective timeout ends it first, or 143 (128 + SIGTERM,
    # errors.Stopped) when Slurm's node-failure handling stops the step first: a race (one run 1
    # after 17.9 s, the next 143 after 14.1 s).  Either prints the failure summary checked below,
    # which a crash (also 1) would not.
    assert srun.returncode in (FAILED, 128 + signal.SIGTERM), f"srun exit {srun.returncode}"
    # 4 s timeout + 5 s for the others to record themselves + shutdown, then Slurm's own
    # node-failure detection (SlurmdTimeout=6), which took over 60 s beside another xdist worker's
    # load (2 of 3 full runs on 2 cores); never a hang.  (rank 0's own naming of the missing node is
    # checked below.)
    assert ended < 120
    assert f"rank 1 on node 1 (host rw-slurm1, {NODES['rw-slurm1']}) never arrived" in stderr, (
        stderr[-4000:]
    )
    # The agent's summary: the failed rank and its host, then what it found (rankwise.setup records
    # it for torchrun's failure summary): the node that went away.
    summary = stderr[stderr.index("rankwise launch: worker(s) failed:") :]
    assert summary.startswith(
        "rankwise launch: worker(s) failed:\n  rank 0 (host rw-slurm0, local rank 0"
    ), summary
    assert "rank 1 on node 1 (host rw-slurm1" in summary.splitlines()[1], summary
    # Slurm's own view, once SlurmdTimeout passed
    assert "srun: error: Node failure on rw-slurm1" in stderr
