"""Prefect flows that only compose tasks: train_loop.py (flow "ragen", deployment "train-loop") and others."""
