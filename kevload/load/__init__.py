"""How a run is run: schedules and trace replay, a level's rules, sending and cutting, workers and
Ray."""
