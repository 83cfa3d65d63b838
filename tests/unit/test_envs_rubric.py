"""Rubric: weighting, argument selection by name, async and group functions, failures."""

from __future__ import annotations

import asyncio

from rlkit.envs import Rollout, Rubric, ThinkParser


def _rollout(text: str, answer: str = "a", **info: object) -> Rollout:
    return Rollout(
        prompt=[{"role": "user", "content": "q"}],
        completion=[{"role": "assistant", "content": text}],
        answer=answer,
        info=dict(info),
    )


async def test_weighted_sum_and_metrics() -> None:
    def exact(completion, answer, parser) -> float:
        return float(parser.parse_answer(completion) == answer)

    async def length_penalty(completion) -> float:
        await asyncio.sleep(0)
        return -len(completion[-1]["content"]) / 10

    rubric = Rubric([exact, length_penalty], [2.0, 0.5], parser=ThinkParser())
    rollouts = [_rollout("<think>x</think>a"), _rollout("b")]
    await rubric.score_group(rollouts)
    assert rollouts[0].metrics == {"exact": 1.0, "length_penalty": -1.7}
    assert rollouts[0].reward == 2.0 * 1.0 + 0.5 * -1.7
    assert rollouts[1].reward == 0.5 * -0.1
    assert rollouts[0].error is None and "scoring_s" in rollouts[0].timings


async def test_functions_receive_arguments_by_name_or_kwargs() -> None:
    seen: dict[str, object] = {}

    def wants_info_state(info, state) -> float:
        seen["info"], seen["state"] = info, state
        return 1.0

    def wants_all(**kwargs) -> float:
        seen["all"] = sorted(kwargs)
        return 0.0

    rollout = _rollout("x", level=3)
    rollout.state["turn"] = 1
    await Rubric([wants_info_state, wants_all]).score_group([rollout])
    assert seen["info"] == {"level": 3} and seen["state"] == {"turn": 1}
    assert seen["all"] == ["answer", "completion", "info", "parser", "prompt", "state"]


async def test_group_function_sees_the_whole_group() -> None:
    def rank_by_length(completions, answers) -> list[float]:
        lengths = [len(c[-1]["content"]) for c in completions]
        return [1.0 if n == max(lengths) else 0.0 for n in lengths]

    rubric = Rubric()
    rubric.add_reward_func(rank_by_length, weight=3.0, group=True)
    rollouts = [_rollout("a"), _rollout("abc"), _rollout("ab")]
    await rubric.score_group(rollouts)
    assert [r.reward for r in rollouts] == [0.0, 3.0, 0.0]
    assert rollouts[1].metrics == {"rank_by_length": 1.0}


async def test_raising_function_errors_only_its_rollout() -> None:
    def fragile(completion) -> float:
        if completion[-1]["content"] == "boom":
            raise RuntimeError("cannot score")
        return 1.0

    rollouts = [_rollout("ok"), _rollout("boom")]
    await Rubric([fragile]).score_group(rollouts)
    assert rollouts[0].reward == 1.0 and rollouts[0].error is None
    assert rollouts[1].reward == 0.0
    assert rollouts[1].error is not None and "'fragile'" in rollouts[1].error
    assert "cannot score" in rollouts[1].error


async def test_raising_or_wrong_length_group_function_errors_the_group() -> None:
    def short(completions) -> list[float]:
        return [1.0]

    rubric = Rubric()
    rubric.add_reward_func(short, group=True)
    rollouts = [_rollout("a"), _rollout("b")]
    await rubric.score_group(rollouts)
    assert all(r.error and "'short'" in r.error and "1 scores for 2" in r.error for r in rollouts)


async def test_rollouts_that_failed_generation_are_not_scored() -> None:
    calls = []

    def count(completion) -> float:
        calls.append(1)
        return 1.0

    failed = _rollout("x")
    failed.error = "generation failed: HTTP 500"
    await Rubric([count]).score_group([failed, _rollout("y")])
    assert len(calls) == 1 and failed.reward == 0.0 and failed.error.startswith("generation")
