"""The api_server front: request parsing, early checks, limits, tool calls, errors, the proxy."""
