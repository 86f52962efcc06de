"""The guide: ``diagnose`` (steps 1–5), a prompt set's coverage (step 4), cases found and rerun
(step 5)."""
