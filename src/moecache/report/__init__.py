"""The paper's outputs: the tables, the figures and the numbers the docs embed (equation (1)
and the overlap cost model are moecache.costs')."""
