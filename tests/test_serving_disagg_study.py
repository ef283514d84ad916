"""validation.studies.serving.disagg: one mode searched alone (its optimum with --method exact), both compared."""

from __future__ import annotations

import json

import pytest

from validation.studies.serving import disagg as serving_disagg


def test_one_mode_alone_names_no_winner(capsys):
    out = serving_disagg.main(["--cases", "small-dense", "--modes", "agg", "--budget", "3", "--confirm", "2"])
    r = out["small-dense"]
    assert "agg" in r and "disagg" not in r
    assert r["winner"] is None and r["margin"] is None
    assert r["agg"]["sims"] <= 3 and r["agg"]["met"]
    printed = capsys.readouterr().out
    assert "one mode searched" in printed
    line = json.loads(printed.strip().splitlines()[-1])
    assert line["small-dense"]["disagg"] is None and line["small-dense"]["agg"] > 0


def test_both_modes_name_the_winner():
    r = serving_disagg.main(["--cases", "small-dense", "--budget", "8", "--confirm", "2"])["small-dense"]
    a, d = r["agg"]["search"]["tokens_per_s_per_gpu"], r["disagg"]["search"]["tokens_per_s_per_gpu"]
    assert r["winner"] == ("agg" if a > d else "disagg")
    assert r["margin"] == round(max(a, d) / min(a, d) - 1, 4)


def test_screen_prints_screened_against_simulated(capsys):
    rows = serving_disagg.main(["--cases", "small-dense", "--screen"])["screen"]
    assert 1 <= len(rows) <= 4
    for r in rows:
        assert r["plan"].startswith("disagg")
        assert r["simulated"]["tpot_ms"] == pytest.approx(r["screened"]["tpot_ms"], rel=0.1)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["screen"] == rows


@pytest.mark.parametrize(("args", "field"), [(["--pool-seeds", "-1"], "--pool-seeds"), (["--budget", "0"], "--budget")])
def test_bad_arguments_are_one_line_exit_2(capsys, args, field):
    with pytest.raises(SystemExit) as exc:
        serving_disagg.main(["--methods-on", "small-dense", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert field in err[-1] and "Traceback" not in "\n".join(err)


def test_searches_run_with_the_planner_settings_shard_search_uses(monkeypatch):
    """A study's PPO is the CLI's PPO (``conf/planner/ppo.yaml``: an elite prior, five elite records),
    not the paper's defaults of the schema: ``compare`` hands each search the composed planner node."""
    from types import SimpleNamespace

    from planner.config import PlannerConfig
    from validation.studies.common.scenarios import planner_config

    seen = []

    def fake_search(ctx, cfg, search, method, seed, graph=None, pcfg=None, **_):
        seen.append((method, pcfg))
        ev = SimpleNamespace(ranked=lambda: [], sims=0, actions=SimpleNamespace(size=1), records={})
        return ev, {}

    monkeypatch.setattr(serving_disagg, "search_plans", fake_search)
    serving_disagg.compare("small-dense", serving_disagg.CASES["small-dense"], "ppo", 4, 0, 2)
    assert [m for m, _ in seen] == ["ppo", "ppo"]
    shipped = planner_config("ppo")
    assert shipped.elite_prior != PlannerConfig().elite_prior  # the test means something
    assert all(p.elite_prior == shipped.elite_prior and p.T == shipped.T for _, p in seen)
