"""Statistics both papers' analyses use: rank correlations beside Kendall's tau (footrule, NDCG), rank-biased
overlap, permutation and Welch tests, OLS, RSA of agreement against metadata, and metric MDS. numpy at import;
scipy inside the functions."""
