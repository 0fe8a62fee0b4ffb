"""Helpers that several test modules share (engines, configs, fixtures, command runners):
test modules import them from here, never from one another."""
