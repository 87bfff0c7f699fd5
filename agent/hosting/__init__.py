"""What both servers share (`sandcell serve`, `sandcell mcp --http`), below them so that
neither imports the other: the Host/Origin/token guard (guard), users and their tokens
(users), the listening socket and uvicorn's run (listening), and the command-line options
they both take (options)."""
