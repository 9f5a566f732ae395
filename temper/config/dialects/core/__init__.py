"""The dialect engine every dialect shares: dotted paths, the rule kinds, the walk of a file against a key table, the translation context, the dialect-side error wording."""
