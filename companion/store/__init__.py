"""What a companion keeps on disk, under one data directory.

- :mod:`.sqlite` -- the conversation store: history, working memory, replied and known ids,
  decisions (an in-memory view written behind)
- :mod:`.history` -- the history seam the engine and the action runtime read
- :mod:`.kv` -- the tools' own key-value memory
- :mod:`.writer` -- one writer thread per SQLite connection
- :mod:`.layout` -- the directory's layout version and its migrations
- :mod:`.dirlock` -- the OS lock that keeps one process per companion
"""
