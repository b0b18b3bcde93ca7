"""`otel-gpu status`: the running collector writes what it is doing to a small state
file (file.py, writer.py); the `status` command reads it, without root (command.py)."""
