"""The generated pages of docs/: each module prints its page (`python -m otel_gpu.docgen.<page>`),
and tests/unit/test_docs.py fails when a committed page and the code differ."""
