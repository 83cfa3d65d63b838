"""`rlkit env audit`: exploit policies played through an environment's own rollout and rubric.

Small environments with known flaws (a substring match a list of candidates beats, a similarity
an echo earns, a lopsided two-way split) must fail the audit on the exploit that farms them; an
exact-match rubric must pass; environment-provided exploits, entry points, `--json` and bad
input behave as documented."""

from __future__ import annotations

import json
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset

from rlkit.envs import Rubric, SingleTurnEnv
from rlkit.envs.audit import audit_environment, report_lines
from rlkit.envs.exploits import Exploit, answer_slot, exploits_for, prompt_candidates, reply
from rlkit.envs.parsers import extract_boxed_answer, last_assistant_text
from tests.helpers.cli import run_cli

QUESTIONS = [f"What is {a} plus {b}?" for a, b in [(3, 4), (10, 5), (7, 8), (20, 22), (6, 6)]]
ANSWERS = ["7", "15", "15", "42", "12"]


class BoxedEnv(SingleTurnEnv):
    """Answers in `\\boxed{}`; the gold completion says so."""

    def gold_completion(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return reply(f"The sum is \\boxed{{{row['answer']}}}.")


def boxed_env(reward: Any, questions: list[str] = QUESTIONS, answers: list[str] = ANSWERS):
    data = Dataset.from_dict({"question": questions, "answer": answers})
    return BoxedEnv(eval_dataset=data, rubric=Rubric([reward]), env_id="sums")


def exact_boxed(completion: list[dict[str, Any]], answer: str) -> float:
    return float(extract_boxed_answer(last_assistant_text(completion)) == answer)


def answer_anywhere(completion: list[dict[str, Any]], answer: str) -> float:
    """The flaw the issue names for QA: any mention of the answer pays."""
    return float(answer in last_assistant_text(completion).split(", "))


def similarity(completion: list[dict[str, Any]], answer: str, prompt: Any) -> float:
    return SequenceMatcher(None, last_assistant_text(completion), answer).ratio()


def test_exact_match_rubric_passes_every_generic_exploit() -> None:
    report = audit_environment(boxed_env(exact_boxed), num_rows=5)
    assert report.gold_mean == 1.0 and report.empty_mean == 0.0
    assert report.ok, report_lines(report)
    names = {e.name for e in report.exploits}
    assert {"echo", "constant", "many candidates", "format only", "judge bait"} <= names
    for exploit in report.exploits:
        assert exploit.full_reward_rows == [] and exploit.mean == 0.0


def test_listing_every_candidate_fails_a_substring_rubric() -> None:
    report = audit_environment(boxed_env(answer_anywhere), num_rows=5)
    assert not report.ok
    failing = {e.name: e for e in report.failures}
    assert "many candidates" in failing
    assert failing["many candidates"].full_reward_rows  # rows named, with the variant
    assert "full reward on" in (failing["many candidates"].problem or "")


def test_partial_credit_an_echo_earns_fails_on_the_mean() -> None:
    data = Dataset.from_dict({"question": ["abcdefgh", "hgfedcba"], "answer": ["hgfe", "abcd"]})
    env = SingleTurnEnv(eval_dataset=data, rubric=Rubric([similarity]), env_id="rev")
    report = audit_environment(env, num_rows=2)
    echo = next(e for e in report.exploits if e.name == "echo")
    assert echo.full_reward_rows == [] and echo.mean > 0.1
    assert echo.problem is not None and "above the floor" in echo.problem


def test_a_constant_equal_to_the_answer_is_not_an_exploit() -> None:
    env = boxed_env(exact_boxed, ["What is 0 times 5?"], ["0"])
    report = audit_environment(env, num_rows=1)
    constant = next(e for e in report.exploits if e.name == "constant")
    assert "0" not in {v.name for v in constant.variants}
    assert report.ok


def two_way_env(yes_share: float, n: int = 10) -> SingleTurnEnv:
    answers = ["yes" if i < round(n * yes_share) else "no" for i in range(n)]
    data = Dataset.from_dict(
        {"question": [f"Is {i} special?" for i in range(n)], "answer": answers}
    )

    def exact(completion: list[dict[str, Any]], answer: str) -> float:
        return float(last_assistant_text(completion).strip() == answer)

    env = SingleTurnEnv(eval_dataset=data, rubric=Rubric([exact]), env_id="yesno")
    env.exploits.append(
        Exploit(
            "guess",
            lambda env, row: {"yes": reply("yes"), "no": reply("no")},
            two_way=True,
            family="yesno",
        )
    )
    return env


def test_two_way_guesses_are_reported_apart_and_fail_only_when_lopsided() -> None:
    balanced = audit_environment(two_way_env(0.5), num_rows=10)
    guess = next(e for e in balanced.exploits if e.name == "guess")
    assert guess.balance == pytest.approx(0.5) and guess.problem is None
    assert balanced.ok, report_lines(balanced)
    assert any("two-way" in line for line in report_lines(balanced))

    few = audit_environment(two_way_env(0.8), num_rows=10)  # 8 of 10: within a coin's luck
    guess = next(e for e in few.exploits if e.name == "guess")
    assert guess.balance == pytest.approx(0.8) and guess.problem is None

    lopsided = audit_environment(two_way_env(0.8, n=50), num_rows=50)
    guess = next(e for e in lopsided.exploits if e.name == "guess")
    assert guess.balance == pytest.approx(0.8)
    assert guess.problem is not None and "lopsided" in guess.problem


def test_answer_slot_speaks_the_gold_format() -> None:
    env = boxed_env(exact_boxed)
    row = dict(env.get_eval_dataset()[0])
    put = answer_slot(env, row)
    assert put is not None
    assert put("99") == reply("The sum is \\boxed{99}.")
    assert prompt_candidates(row) == ["What", "3", "4"]


def test_environment_exploits_and_their_errors_are_played() -> None:
    env = boxed_env(exact_boxed)
    env.exploits.append(
        Exploit("cheat", lambda env, row: {"gold": env.gold_completion(row)}, family="sums")
    )
    report = audit_environment(env, num_rows=2, only=["cheat"])
    assert [e.name for e in report.exploits] == ["cheat"]
    assert report.failures[0].full_reward_rows == ["0 (gold)", "1 (gold)"]
    with pytest.raises(ValueError, match="unknown exploit"):
        audit_environment(env, num_rows=2, only=["nope"])


def test_entry_point_exploits_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlkit.envs.exploits as exploits

    class Point:
        name = "sums"

        def load(self) -> Any:
            return lambda env: [Exploit("third party", lambda env, row: {"x": reply("x")})]

    monkeypatch.setattr(exploits, "entry_points", lambda group: [Point()])
    assert "third party" in [e.name for e in exploits_for(boxed_env(exact_boxed))]


ENV_SOURCE = """
from datasets import Dataset
from rlkit.envs import Rubric, SingleTurnEnv
from rlkit.envs.parsers import last_assistant_text


def load_environment(flawed: bool = True):
    data = Dataset.from_dict({"question": ["Name the colour of snow."], "answer": ["white"]})

    def reward(completion, answer):
        text = last_assistant_text(completion).lower()
        return float(bool(text.strip())) if flawed else float(text.strip() == answer)

    return SingleTurnEnv(eval_dataset=data, rubric=Rubric([reward]), env_id="audit-demo")
"""


@pytest.fixture
def demo_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    package = tmp_path / "audit-demo"
    package.mkdir()
    (package / "audit_demo.py").write_text(ENV_SOURCE)
    monkeypatch.setenv("RLKIT_ENV_PATH", str(tmp_path))
    return "audit-demo"


def test_cli_exit_codes_and_json(
    demo_env: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    code, out = run_cli(monkeypatch, capsys, "env", "audit", demo_env, "-n", "1")
    assert code == 1 and "earn reward without the task" in out  # any reply pays
    code, out = run_cli(
        monkeypatch, capsys, "env", "audit", demo_env, "-a", '{"flawed": false}', "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["ok"] is True and data["env_id"] == "audit-demo"
    assert {row["exploit"] for row in data["table"]} >= {"echo", "constant"}
    code, out = run_cli(monkeypatch, capsys, "env", "audit", demo_env, "--exploits", "bogus")
    assert code == 2 and "unknown exploit" in out
    code, out = run_cli(monkeypatch, capsys, "env", "check", demo_env, "--audit", "-n", "1")
    assert code == 1 and "earn reward without the task" in out


def test_a_family_exploit_replaces_the_generic_one_of_its_name() -> None:
    env = boxed_env(exact_boxed)
    env.exploits.append(Exploit("look-alike", lambda env, row: {}, family="sums"))
    exploits = {e.name: e for e in exploits_for(env)}
    assert exploits["look-alike"].family == "sums"
    assert [e.name for e in exploits_for(env)].count("look-alike") == 1
