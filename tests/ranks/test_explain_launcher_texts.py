"""The verdict on the logs of launchers and backends a CPU cannot run: NCCL's watchdog, torchrun
1.x's summary, DeepSpeed's launcher, Lightning, accelerate, ROCm. torchrun's summaries are made by
torch's own ``ChildFailedError``; the other lines are the texts those programs print (the NCCL
lines as torch 2.4-2.6 print them, e.g. pytorch/pytorch#118369, XPixelGroup/BasicSR#737)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from pytorch_texts import ASSERT_2_0, H100_TORCH_2_11, HINT_2_0

from nb_cudaguard.ranks.logs import read_directory, read_text
from nb_cudaguard.ranks.rerun import rerun
from nb_cudaguard.ranks.verdict import Verdict, judge

LABEL_LINE = H100_TORCH_2_11["cross-entropy-label"][0]
LABEL_TITLE = "A class label is outside 0..num_classes-1"
WORK = (
    "WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000)"
)
DATA = Path(__file__).with_name("data")
# torch 1.9's layout (torch/distributed/elastic/multiprocessing/errors/__init__.py of v1.9.0:
# "Root Cause:" first, "msg:"), DeepSpeed's launcher (deepspeed/launcher/{runner,launch}.py,
# the timeouts of pytorch/pytorch#118369), Lightning's DDP start lines. Each with {device} and
# {traceback} where the failing rank's lines go.
TORCH_1_9_SUMMARY = (DATA / "torchrun_1_9_summary.txt").read_text(encoding="utf-8")
DEEPSPEED_LOG = (DATA / "deepspeed_launcher.log").read_text(encoding="utf-8")
LIGHTNING_LOG = (DATA / "lightning_ddp.log").read_text(encoding="utf-8")


def summary(
    tmp: Path, name: str, failures: dict[int, tuple[int, int, float]], root_first: int
) -> str:
    """torchrun's own summary: {rank: (exitcode, pid, timestamp)}; torch picks the root cause
    by the earliest timestamp, as it does in a real run."""
    errors = pytest.importorskip("torch.distributed.elastic.multiprocessing.errors")
    found = {}
    for rank, (code, pid, stamp) in failures.items():
        failure = errors.ProcessFailure(rank, pid, code, str(tmp / f"absent-{rank}.json"))
        failure.timestamp = int(stamp)
        found[rank] = failure
    error = errors.ChildFailedError(name, found)
    assert error.get_first_failure()[0] == root_first
    return f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: {error}"


def nccl_timeout(rank: int) -> str:
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"
    stamp = "[E626 06:24:44.903881913"
    return "\n".join(
        [
            f"[rank{rank}]:{stamp} ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught "
            f"collective operation timeout: {WORK} ran for 600020 milliseconds before timing out.",
            f"[rank{rank}]:{stamp} ProcessGroupNCCL.cpp:684] [Rank {rank}] Some NCCL operations "
            "have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent "
            "GPU operations might run on corrupted/incomplete data.",
            f"[rank{rank}]:{stamp} ProcessGroupNCCL.cpp:698] [Rank {rank}] To avoid data "
            "inconsistency, we are taking the entire process down.",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            f"  what():  {pg} Process group watchdog thread terminated with exception: [Rank "
            f"{rank}] Watchdog caught collective operation timeout: {WORK} ran for 600020 "
            "milliseconds before timing out.",
            "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:609 (most recent call first):",
        ]
    )


def culprit_traceback(rank: int | None, text: str = ASSERT_2_0) -> str:
    prefix = f"[rank{rank}]: " if rank is not None else ""
    lines = [
        "Traceback (most recent call last):",
        '  File "/home/u/train.py", line 88, in <module>',
        "    running_loss += loss.item()",
        f"RuntimeError: {text}",
    ]
    return "\n".join(prefix + line for line in "\n".join(lines).splitlines())


def verdict(text: str) -> Verdict:
    job = read_text(text)
    assert job is not None
    return judge(job)


def test_nccl_victims_timing_out_first_leave_the_culprit_named(tmp_path: Path):
    log = "\n".join(
        [
            nccl_timeout(0),
            nccl_timeout(1),
            nccl_timeout(3),
            LABEL_LINE,  # printed by the CUDA runtime, without a rank prefix
            culprit_traceback(2),
            summary(
                tmp_path,
                "train.py",
                {0: (-6, 101, 100.0), 1: (-6, 102, 100.5), 2: (1, 103, 101.0), 3: (-6, 104, 101.0)},
                root_first=0,
            ),
        ]
    )
    found = verdict(log)
    assert [c.log.rank for c in found.culprits] == [2]
    assert found.line.startswith("rank 2 (")
    assert found.line.endswith(f"{LABEL_TITLE}; ranks 0, 1 and 3 were stopped because of it")
    assert {r.log.rank: r.reason for r in found.roles if r.role == "victim"} == {
        0: "collective timed out",
        1: "collective timed out",
        3: "collective timed out",
    }
    assert any("names rank 0, a victim" in note for note in found.notes)


def test_the_culprits_own_watchdog_abort_still_makes_it_the_culprit(tmp_path: Path):
    # On NCCL the failing rank's watchdog meets the CUDA error and aborts the process (-6),
    # just as its peers' watchdogs abort them on the timeout.
    pg = "[PG 0 Rank 1]"
    culprit = "\n".join(
        [
            f"[rank1]:[E ProcessGroupNCCL.cpp:1414] {pg} Process group watchdog thread "
            f"terminated with exception: CUDA error: device-side assert triggered",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            f"  what():  {pg} Process group watchdog thread terminated with exception: CUDA "
            f"error: device-side assert triggered{HINT_2_0}",
        ]
    )
    log = "\n".join(
        [
            nccl_timeout(0),
            culprit,
            summary(tmp_path, "train.py", {0: (-6, 11, 50.0), 1: (-6, 12, 60.0)}, root_first=0),
        ]
    )
    found = verdict(log)
    roles = {r.log.rank: r.role for r in found.roles}
    assert roles == {0: "victim", 1: "culprit"}


def test_a_peer_stopped_by_nb_cudaguard_quotes_the_cause_but_is_no_culprit():
    log = "\n".join(
        [
            "[rank0]: RuntimeError: stopped because rank 1 failed: CUDA error: device-side "
            "assert triggered",
            culprit_traceback(1),
        ]
    )
    found = verdict(log)
    assert {r.log.rank: (r.role, r.reason) for r in found.roles} == {
        0: ("victim", "stopped by its peer"),
        1: ("culprit", "A GPU kernel hit a device-side assert"),
    }


def test_torchrun_1_9_layout_without_rank_prefixes():
    log = "\n".join([LABEL_LINE, culprit_traceback(None), TORCH_1_9_SUMMARY])
    found = verdict(log)
    # Only the summary says which rank is which: rank 0 was aborted (as NCCL's watchdog ends
    # a timed-out peer), rank 1 exited with status 1, as a Python exception ends a process:
    # the one Python traceback in the log, the assert's, is rank 1's.
    assert found.job.root_cause == 0
    assert found.job.script == "train.py"
    assert [c.log.rank for c in found.culprits] == [1]
    assert found.culprits[0].inferred
    assert found.line == f"rank 1 (local rank 1): {LABEL_TITLE}; rank 0 was stopped because of it"
    assert "the only rank that exited with an exception's status (1)" in found.notes[0]


def test_two_ranks_that_could_have_printed_the_assert_are_both_named_as_suspects():
    two = TORCH_1_9_SUMMARY.replace("exitcode: -6 (pid: 2201)", "exitcode: 1 (pid: 2201)")
    two = two.replace("Signal 6 (SIGABRT) received by PID 2201", "Process failed with exitcode 1")
    found = verdict("\n".join([LABEL_LINE, culprit_traceback(None), two]))
    assert found.culprits == ()
    assert found.line == f"a rank the log does not name: {LABEL_TITLE}"
    assert found.notes[0].endswith(
        "ranks 0 and 1 printed nothing that says they waited on a peer: it is one of them."
    )


def test_deepspeed_launcher_log_names_the_rank_left_when_the_others_timed_out():
    log = DEEPSPEED_LOG.replace("{device}", LABEL_LINE)
    log = log.replace("{traceback}", culprit_traceback(None))
    found = verdict(log)
    assert found.job.launcher == "deepspeed"
    assert [c.log.rank for c in found.culprits] == [1]
    assert found.culprits[0].inferred
    again = rerun(found.job, 1)
    assert again.command == (
        "CUDA_LAUNCH_BLOCKING=1 deepspeed <your deepspeed options> --enable_each_rank_log <dir> "
        "trainer_sft.py --configs llama2-7b-sft --deepspeed"
    )


def test_lightning_ddp_gets_a_verdict_and_its_own_rerun():
    log = LIGHTNING_LOG.replace("{device}", LABEL_LINE)
    log = log.replace("{traceback}", culprit_traceback(None))
    found = verdict(log)
    assert found.job.launcher == "lightning"
    assert found.line == f"a rank the log does not name: {LABEL_TITLE}"
    command = rerun(found.job, None).command
    assert command.startswith("CUDA_LAUNCH_BLOCKING=1 python /home/u/train.py")


def test_accelerate_launch_is_rerun_with_accelerate(tmp_path: Path):
    agent = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/accelerate", line 8, in <module>',
            '  File "/usr/local/lib/python3.10/dist-packages/accelerate/commands/launch.py", '
            "line 1168, in launch_command",
            summary(tmp_path, "train.py", {1: (1, 7, 10.0), 0: (-15, 6, 11.0)}, root_first=1),
        ]
    )
    found = verdict("\n".join([LABEL_LINE, culprit_traceback(1), agent]))
    assert found.job.launcher == "accelerate"
    assert rerun(found.job, 1).command == (
        "CUDA_LAUNCH_BLOCKING=1 accelerate launch <your accelerate options> train.py <args>"
    )
    assert {r.log.rank: r.role for r in found.roles} == {0: "collateral", 1: "culprit"}


def test_rocm_hip_assert_under_torchrun():
    hip_line = (
        "/pytorch/aten/src/ATen/native/hip/Loss.hip:250: nll_loss_forward_reduce_cuda_kernel_2d: "
        "Device-side assertion `t >= 0 && t < n_classes' failed."
    )
    hip_error = ASSERT_2_0.replace("CUDA error", "HIP error").replace("CUDA kernel", "HIP kernel")
    log = "\n".join([hip_line, culprit_traceback(3, hip_error), nccl_timeout(0)])
    found = verdict(log)
    assert [c.log.rank for c in found.culprits] == [3]
    assert found.diagnosis is not None and found.diagnosis.cause == "label-out-of-range"


def test_a_plain_torchelastic_error_file_without_our_key(tmp_path: Path):
    attempt = tmp_path / "run_x" / "attempt_0"
    for local, text in ((0, "RuntimeError: Connection closed by peer"), (1, ASSERT_2_0)):
        folder = attempt / str(local)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text("", encoding="utf-8")
        data = {
            "message": {
                "message": text,
                "extraInfo": {"py_callstack": text, "timestamp": "1795717715"},
            }
        }
        (folder / "error.json").write_text(json.dumps(data), encoding="utf-8")
    job = read_directory(tmp_path)
    assert job is not None
    found = judge(job)
    assert [c.log.rank for c in found.culprits] == [1]
    assert found.line.endswith("; rank 0 was stopped because of it")


def test_a_single_process_log_is_not_a_job():
    assert read_text(culprit_traceback(None)) is None


def test_ranks_failing_alike_share_the_line_and_another_cause_is_noted(tmp_path: Path):
    oom = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"
    assertion = f"RuntimeError: {ASSERT_2_0}"
    records = [
        {"rank": 2, "time": 10.0, "kind": "cuda-error", "exception": assertion},
        {"rank": 0, "time": 11.0, "kind": "cuda-error", "exception": assertion},
        {"rank": 3, "time": 12.0, "kind": "cuda-error", "exception": f"OutOfMemoryError: {oom}"},
        {"rank": 1, "time": 9.0, "kind": "stopped-by-peer", "exception": "RuntimeError: stopped"},
    ]
    for record in records:
        line = [LABEL_LINE] if "assert" in record["exception"] else []
        data = {
            "nb_cudaguard_rank_record": 1,
            "local_rank": record["rank"],
            "world_size": 4,
            "host": "node7",
            "pid": 100,
            "device_lines": line,
            "diagnosis": None,
            **record,
        }
        (tmp_path / f"rank-{record['rank']}.json").write_text(json.dumps(data), encoding="utf-8")
    job = read_directory(tmp_path)
    assert job is not None
    found = judge(job)
    assert [c.log.rank for c in found.culprits] == [2, 0, 3]  # by each rank's own clock
    assert found.line == (
        f"rank 2 (node7, local rank 2), then rank 0: {LABEL_TITLE}; rank 1 was stopped because "
        "of it"
    )
    assert found.notes == (
        "Rank 3 failed too, later: A CUDA error that leaves the CUDA context usable.",
    )


def test_pdsh_host_prefixes_give_each_rank_its_host():
    log = "\n".join(
        [
            *(f"worker-1: {line}" for line in culprit_traceback(5).splitlines()),
            "worker-0: [rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:"
            "598] Connection closed by peer [10.1.0.2]:42211",
        ]
    )
    found = verdict(log)
    assert found.line.startswith("rank 5 (worker-1): A GPU kernel hit a device-side assert")
    assert {r.log.rank: r.log.host for r in found.roles} == {0: "worker-0", 5: "worker-1"}


def test_a_guard_refusal_record_names_its_rank_without_a_cuda_error(tmp_path: Path):
    refusal = (
        "GuardRefusal: cross_entropy: target holds 7, outside 0..4 (num_classes=5); the batch "
        "never reached the GPU"
    )
    records = [
        {"rank": 1, "kind": "guard-refusal", "headline": refusal, "exception": refusal},
        {
            "rank": 0,
            "kind": "stopped-by-peer",
            "headline": "stopped because rank 1 failed",
            "exception": f"RuntimeError: stopped because rank 1 failed: {refusal}",
        },
    ]
    for number, record in enumerate(records):
        data = {
            "nb_cudaguard_rank_record": 1,
            "local_rank": record["rank"],
            "world_size": 2,
            "host": "kaggle",
            "pid": 40 + number,
            "time": 5.0 - number,
            "cause_id": None,
            "device_lines": [],
            "diagnosis": None,
            **record,
        }
        (tmp_path / f"rank-{record['rank']}.json").write_text(json.dumps(data), encoding="utf-8")
    job = read_directory(tmp_path)
    assert job is not None
    found = judge(job)
    assert found.line == (
        f"rank 1 (kaggle, local rank 1): {refusal}; rank 0 was stopped because of it"
    )
    result = subprocess.run(
        [sys.executable, "-m", "nb_cudaguard", "explain", "--json", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)["distributed"]
    assert payload["culprit"] == 1
    assert payload["rerun"] is None  # nothing broke: a blocking run would show nothing more


def test_a_rank_of_a_known_world_that_printed_nothing_is_the_one_left():
    # Lightning says the world is 3; ranks 0 and 2 print that they timed out, rank 1 nothing:
    # the unprefixed assert is rank 1's.
    log = "\n".join(
        [
            LIGHTNING_LOG.replace("MEMBER: 2/2", "MEMBER: 2/3")
            .replace("{device}", LABEL_LINE)
            .replace("{traceback}", culprit_traceback(None)),
            nccl_timeout(0),
            nccl_timeout(2),
        ]
    )
    found = verdict(log)
    assert found.job.world_size == 3
    assert [c.log.rank for c in found.culprits] == [1]
    assert found.line == f"rank 1: {LABEL_TITLE}; ranks 0 and 2 were stopped because of it"


@pytest.mark.parametrize(
    ("echoed", "expected"),
    [
        (
            "$ python -m torch.distributed.launch --nproc_per_node=2 --use_env train.py --lr 3",
            "CUDA_LAUNCH_BLOCKING=1 python -m torch.distributed.launch --nproc_per_node=2 "
            "--use_env --local-ranks-filter 1 --redirects 3 --log-dir <dir> train.py --lr 3",
        ),
        (
            "+ CUDA_LAUNCH_BLOCKING=0 torchrun --nnodes 1 --tee 3 --log-dir runs/a train.py",
            "CUDA_LAUNCH_BLOCKING=1 torchrun --nnodes 1 --local-ranks-filter 1 --redirects 3 "
            "--log-dir runs/a train.py",
        ),
        (
            "$ accelerate launch --multi_gpu --num_processes 2 train.py --bf16",
            "CUDA_LAUNCH_BLOCKING=1 accelerate launch --multi_gpu --num_processes 2 train.py "
            "--bf16",
        ),
    ],
)
def test_an_echoed_launch_command_is_rerun_with_its_own_options(echoed: str, expected: str):
    found = verdict("\n".join([echoed, LABEL_LINE, culprit_traceback(1), nccl_timeout(0)]))
    assert rerun(found.job, 1).command == expected


# deepspeedai/Megatron-DeepSpeed#207: the paste ends in torchrun's own traceback, before its
# ChildFailedError; the agent named the failed local rank and sent the seven others SIGTERM.
AGENT_ONLY_LOG = (
    "\n".join(
        "../aten/src/ATen/native/cuda/Indexing.cu:1141: indexSelectLargeIndex: block: [615,0,0], "
        f"thread: [{thread},0,0] Assertion `srcIndex < srcSelectDimSize` failed."
        for thread in (121, 122, 123)
    )
    + "\n"
    + "\n".join(
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process "
        f"{pid} closing signal SIGTERM"
        for pid in range(142438, 142445)
    )
    + """
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 0 (pid: 142437) of binary: /opt/conda/bin/python
Traceback (most recent call last):
  File "/opt/conda/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/opt/conda/lib/python3.8/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 346, in wrapper
    return f(*args, **kwargs)
  File "/opt/conda/lib/python3.8/site-packages/torch/distributed/run.py", line 762, in main
    run(args)
"""  # noqa: E501
)


def test_the_agents_own_lines_make_a_job_whose_one_failed_rank_is_the_culprit():
    found = verdict(AGENT_ONLY_LOG)
    assert [c.log.rank for c in found.culprits] == [0]
    assert found.diagnosis is not None and found.diagnosis.cause == "index-out-of-range"
    assert "stopped the 7 other processes" in " ".join(found.notes)
    # torchrun's console script ran no CUDA: the error did not surface there
    assert found.diagnosis.where is None or "torchrun" not in found.diagnosis.where


def test_one_aborted_rank_alone_with_no_others_stopped_is_not_named():
    # Without the agent's SIGTERMs nothing says the others were still running.
    lines = [line for line in AGENT_ONLY_LOG.splitlines() if "closing signal" not in line]
    found = verdict("\n".join(lines))
    assert found.culprits == ()
