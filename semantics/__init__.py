"""The CMQ model as pure code: no sockets, no asyncio, time from an injected clock."""
