"""Pure comparisons of arrays: tolerances, the element rule and streamed statistics, output comparisons,
error summaries, finiteness. No TensorFlow, no runtimes: two arrays and a tolerance in, one result out."""
