"""Built-in benchmark prompt suite (suite.jsonl) and its loader; see README.md."""
