"""Helpers shared by the unit, integration and browser tests (one of each: look here before
writing one)."""
