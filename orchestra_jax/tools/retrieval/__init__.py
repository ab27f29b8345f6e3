"""Document retrieval for the search tool: BM25 and dense retrievers, index folders, web search and what a search costs."""
