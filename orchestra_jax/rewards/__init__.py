"""Learning signals: is an answer right (outcome, judge), and how good was the episode."""
