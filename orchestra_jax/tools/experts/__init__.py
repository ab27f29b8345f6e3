"""Expert models: the client for OpenAI-compatible servers, offline stand-ins, the catalogue, role prompts and reply protocols."""
