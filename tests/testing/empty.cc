// Keeps ds_testing non-empty.
