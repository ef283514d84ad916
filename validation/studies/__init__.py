"""Validation studies: each simulates a published-measurement CSV and writes rows, a summary and a plot."""
