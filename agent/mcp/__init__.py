"""`sandcell mcp`: the sealed sandbox as an MCP server (stdio and streamable HTTP)."""
