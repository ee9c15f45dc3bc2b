# Sourced by worker_s.sh (issue 15 §1): the capacity searches on the offered-rate axis, with the
# saturation rules and early stop of docs/capacity.md. Each is capped by its timeout; --max-probes
# and --duration are set so that both fit the lease (~6 min each on one H200).
# Each writes its trace (gzipped after), so that `gpuchef report` can re-judge every probe from
# its records if a rule changes (the session-5 and session-6 runs kept only JSON).
CAPF="--capacity --slo itl_p99:100ms,ttft_p50:2s --rate-lo ${CAP_LO:-4} --rate-hi ${CAP_HI:-40} --max-probes ${CAP_PROBES:-4} --duration ${CAP_DUR:-25} --gpus 0"
job s20_cap_cont_chunked ${CAP_T:-400} "gpuchef ab $M $AZ $CAPF --a mode=continuous --b mode=chunked --result-json $R/cap_cont_chunked.json --trace $R/cap_cont_chunked.jsonl; gzip -f $R/cap_cont_chunked.jsonl"
job s21_cap_512_2048 ${CAP_T:-400} "gpuchef ab $M $AZ $CAPF --a mode=chunked,max_num_batched_tokens=512 --b mode=chunked,max_num_batched_tokens=2048 --result-json $R/cap_512_2048.json --trace $R/cap_512_2048.jsonl; gzip -f $R/cap_512_2048.jsonl"
