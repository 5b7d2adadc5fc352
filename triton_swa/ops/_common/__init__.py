"""What several ops share inside their kernels: the online-softmax pieces (soft cap, sink fold) and
the split-KV partials with the kernel that merges them."""
