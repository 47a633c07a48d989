"""agentclaims inside vLLM: a KV connector that holds claimed prefixes' blocks, and the
scheduler that turns a hopeless wait into an explicit refusal. Load it with vLLM's own flags
(see ``connector``); ``tiny_model`` builds the model the tests serve."""

__version__ = "0.1.0"
