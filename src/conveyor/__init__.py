"""Conveyor: an inference batching service."""
