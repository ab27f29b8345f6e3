"""Where a run's files live: local folders or object stores (`gs://`), one path layer."""
