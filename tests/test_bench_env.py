"""`leakgym bench env` writes its JSON and markdown with the documented fields (tiny run)."""

import json

from leakgym.cli import main


def test_bench_env_tiny_run(tmp_path):
    out = tmp_path / "bench_env.json"
    assert main(["bench", "env", "--json", str(out), "--envs", "LeakGym-Digits-v0", "--steps", "2", "--num-envs", "2"]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["num_envs"] for r in rows] == [1, 2]
    for r in rows:
        assert "error" not in r, r
        assert r["env_steps_per_s"] > 0 and r["peak_rss_mb"] > 0
        shares = [r[f"share_{k}"] for k in ("defense", "attack", "score", "fl")]
        assert abs(sum(shares) - 1) < 1e-6
    assert "env steps/s" in out.with_suffix(".md").read_text()
