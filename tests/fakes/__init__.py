"""Test doubles shared by the whole suite: `tests.fakes.fake_openai.FakeOpenAIServer`."""
