"""What each built-in workload is (the seed network, the decoder, a Hugging Face model) and what
its measurement files must say; example workload files in the form a user writes them."""
