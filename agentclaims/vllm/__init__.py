"""agentclaims on a real vLLM: start a server with the connector (``launch``) and speak to it
(``client``). The connector itself is its own distribution, ``integrations/vllm``
(``agentclaims_vllm``), installed into the vLLM server's environment."""

from agentclaims.vllm.client import ConnectorAnswer, ConnectorClient
from agentclaims.vllm.launch import serve_argv, server_env, vllm_python

__all__ = ["ConnectorAnswer", "ConnectorClient", "serve_argv", "server_env", "vllm_python"]
