# Sourced by worker_s.sh (issue 15 §1): the capacity searches on the offered-rate axis, with the
# saturation rules and early stop of docs/capacity.md. Each is capped by its timeout; --max-probes
# and --duration are set so that both fit the lease (~6 min each on one H200).
CAPF="--capacity --slo itl_p99:100ms,ttft_p50:2s --rate-lo 4 --rate-hi 40 --max-probes 4 --duration 25 --gpus 0"
job s20_cap_cont_chunked 400 "gpuchef ab $M $AZ $CAPF --a mode=continuous --b mode=chunked --result-json $R/cap_cont_chunked.json"
job s21_cap_512_2048 400 "gpuchef ab $M $AZ $CAPF --a mode=chunked,max_num_batched_tokens=512 --b mode=chunked,max_num_batched_tokens=2048 --result-json $R/cap_512_2048.json"
