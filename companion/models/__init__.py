"""Language models behind a companion: the interface the engine needs (:mod:`.base`) and its
implementations. Each name is imported from the module that defines it."""
