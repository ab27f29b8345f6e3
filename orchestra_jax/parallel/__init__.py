"""Meshes, parameter sharding rules, multi-host collectives and distributed start-up."""
