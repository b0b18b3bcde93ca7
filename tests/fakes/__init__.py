"""Fakes of outside systems for tests (each module says loudly that it is a fake)."""
