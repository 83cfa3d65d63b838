"""Parsers: think stripping, boxed extraction, XML fields and their format reward."""

from __future__ import annotations

from rlkit.envs import Parser, ThinkParser, XMLParser, extract_boxed_answer


def test_extract_boxed_answer_takes_the_last_and_keeps_nested_braces() -> None:
    text = r"first \boxed{1} then \boxed{\frac{1}{2}} and \boxed {x^{2}}"
    assert extract_boxed_answer(text) == "x^{2}"
    assert extract_boxed_answer(r"so \boxed{\frac{a}{b}}.") == r"\frac{a}{b}"
    assert extract_boxed_answer("no box here") is None
    assert extract_boxed_answer(r"unclosed \boxed{1") is None
    assert extract_boxed_answer(r"\boxed{2} and broken \boxed{3") == "2"


def test_think_parser_strips_reasoning() -> None:
    parser = ThinkParser()
    assert parser.parse("<think>\nlet me see\n</think>\n\n olleh ") == "olleh"
    assert parser.parse("reasoning the template opened</think>answer") == "answer"
    assert parser.parse("<think>never closed, still thinking") == ""
    assert parser.parse("plain answer") == "plain answer"
    assert parser.parse("<think>a</think>x<think>b</think> y") == "y"


def test_think_parser_with_boxed_extraction_reads_chat_messages() -> None:
    parser = ThinkParser(extract_fn=extract_boxed_answer)
    completion = [
        {"role": "assistant", "content": r"<think>\boxed{wrong}</think> so \boxed{42}"},
        {"role": "user", "content": r"\boxed{user text is ignored}"},
    ]
    assert parser.parse_answer(completion) == "42"
    assert parser.parse_answer([{"role": "assistant", "content": "<think>\\boxed{1}"}]) is None


def test_identity_parser() -> None:
    assert Parser().parse_answer([{"role": "assistant", "content": " hi "}]) == " hi "
    assert Parser().parse_answer([]) == ""


def test_xml_parser_fields_answer_and_format_reward() -> None:
    parser = XMLParser(["think", "answer"])
    text = "<think>\nhmm\n</think>\n<answer>\n cba \n</answer>"
    assert parser.parse(text) == {"think": "hmm", "answer": "cba"}
    assert parser.parse_answer([{"role": "assistant", "content": text}]) == "cba"
    assert parser.parse("<answer>1</answer><answer>2</answer>")["answer"] == "2"
    assert parser.parse("nothing") == {"think": None, "answer": None}
    assert parser.format_reward(text) == 1.0
    assert parser.format_reward("<answer>x</answer>") == 0.5
    reward = parser.get_format_reward_func()
    assert reward.__name__ == "format_reward"
    assert reward([{"role": "assistant", "content": "junk"}]) == 0.0
    assert parser.parse(parser.format(think="a", answer="b")) == {"think": "a", "answer": "b"}
