"""What a companion says, as text: where a streamed line is cut into sentences
(:mod:`.sentences`) and whether a line is the character's own (:mod:`.check`). Pure."""
