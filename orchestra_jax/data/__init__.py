"""Training and held-out tasks: task files read into `Task`s, splits, and the Grain task stream."""
