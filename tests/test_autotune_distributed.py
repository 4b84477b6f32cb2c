"""Two CPU ranks (gloo): ``tuner.sync`` gives every rank rank 0's choices; warm-up splits the shapes and shares them.

The test runs this file as a worker script in two subprocesses that meet through a file store
(no ports), each with its own cache folder so the choices can only travel through torch.distributed.
"""
import json
import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_two_ranks_agree(tmp_path):
    store = tmp_path / "store"
    procs = []
    for rank in range(2):
        env = {**os.environ, "MLA_CORE_CACHE_DIR": str(tmp_path / f"cache{rank}"), "MLA_CORE_AUTOTUNE": "cached"}
        procs.append(subprocess.Popen([sys.executable, __file__, str(rank), str(store), str(tmp_path / f"out{rank}.json")],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    r0, r1 = (json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(2))
    # sync: rank 1 never tuned, yet dispatches exactly as rank 0 and has the entry in its own cache file
    assert r0["synced_choice"] == r1["synced_choice"] == ["tt_fast", {"sleep_s": 0.001}]
    assert r1["synced_source"] == "synced" and r1["received"] >= 2
    assert r1["in_own_cache"]
    assert r1["priority_choice_matches_rank0"]
    # warm-up under a process group: each rank tuned its share, both ended with every choice
    assert r0["tuned_here"] and r1["tuned_here"] and set(r0["tuned_here"]).isdisjoint(r1["tuned_here"])
    assert r0["warmup_choices"] == r1["warmup_choices"] and len(r0["warmup_choices"]) == 3
    assert r0["ranks_agree"] is True and r1["ranks_agree"] is True
    assert all(status == "tuned" for status in r0["warmup_status"] + r1["warmup_status"])


def _worker(rank: int, store: str, out: str) -> None:
    import warnings

    import torch.distributed as dist

    sys.path.insert(0, TESTS)
    import autotune_fakes as fakes
    from mla_core import dispatch
    from mla_core.autotune import cache, tuner, warmup
    from mla_core.plugins import registry

    warnings.simplefilter("ignore")
    fk = fakes.install()
    registry().backends.clear()
    registry().backends.update(fk)
    tuner.REFERENCE = "tt_exact"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    result = {}

    tuned_problem, memory_problem = fakes.merge_problem(tokens=32), fakes.merge_problem(tokens=256)
    if rank == 0:
        tuner.record(tuner.tune(tuned_problem, list(fk.values()), warmup=1, repeats=3))
        dispatch._memory[(None, memory_problem)] = dispatch.Choice(fk["tt_exact"], {}, "tuned")  # decided in memory
    result["received"] = tuner.sync()
    choice = dispatch.choose(tuned_problem)
    result["synced_choice"] = [choice.backend.name, choice.config]
    result["synced_source"] = choice.source
    result["in_own_cache"] = tuned_problem.key() in cache.user_entries("cpu")
    result["priority_choice_matches_rank0"] = dispatch.choose(memory_problem).backend.name == "tt_exact"

    problems = [fakes.merge_problem(tokens=t) for t in (8, 16, 64)]
    tuned_here, tune = [], tuner.tune

    def counting_tune(problem, *args, **kwargs):
        tuned_here.append(problem.key())
        return tune(problem, *args, **kwargs)

    tuner.tune = counting_tune
    rows = warmup.run(problems, warmup=1, repeats=3)
    result["warmup_status"] = [r.status for r in rows]
    result["tuned_here"] = tuned_here
    result["warmup_choices"] = [[dispatch.choose(p).backend.name, dispatch.choose(p).config] for p in problems]
    result["ranks_agree"] = warmup.ranks_agree(problems)
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), sys.argv[2], sys.argv[3])
