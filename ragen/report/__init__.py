"""Human-readable reports of a run: sample trajectories as a self-contained HTML page, training curves as PNGs."""
