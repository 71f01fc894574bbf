"""The peer comparison's table: the block drafter's ratio to each peer, and none for a peer whose greedy
outputs differ from vLLM alone (a lossy run measures nothing comparable)."""

from serve_eval.peer_dflash.compare import summary_table


def run(tau: float, identical: bool = True) -> dict:
    return {"prompts": 8, "outputs_identical": identical,
            "vllm": {"tau": tau, "tau_se": 0.1, "num_drafts": 10, "num_accepted_tokens_per_pos": [8, 5]}}


def drafter(tau: float, identical: bool = True) -> dict:
    return {"runs": {"single": {"code": run(tau), "all:code": run(tau)},
                     "batched": {"code": run(tau, identical), "all:code": run(tau, identical)}}}


def test_ratio_per_peer_and_none_for_a_lossy_peer():
    report = {"ours": "mine", "drafters": {"mine": drafter(3.0), "peer:/ckpt/a": drafter(2.5),
                                           "peer:/ckpt/b": drafter(2.0, False)}}
    rows = [line.split(" | ") for line in summary_table(report).splitlines()[2:]]
    assert [(row[0], row[1], row[2], row[-1]) for row in rows] == [
        ("| serve_check (8)", "code", "mine", " |"), ("| serve_check (8)", "code", "/ckpt/a", "1.20x |"),
        ("| serve_check (8)", "code", "/ckpt/b", " |"),
        ("| all (8)", "code", "mine", " |"), ("| all (8)", "code", "/ckpt/a", "1.20x |"), ("| all (8)", "code", "/ckpt/b", " |")]
    assert rows[0][6] == "0.80 0.50" and rows[2][5] == "False"
