import sys
from pathlib import Path

# tests.fakes / tests.bpf.* are importable from every tier.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
