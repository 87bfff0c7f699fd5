"""The model wing: the OpenAI-compatible client (openai_model) with its request assembly,
deadline, retries, endpoint quirks and redaction, its settings, and the scripted replay model
that stands in for an endpoint in `--replay`, the demo and the tests."""
