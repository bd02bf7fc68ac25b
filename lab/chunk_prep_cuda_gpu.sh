python3 -m pip install --no-deps --no-build-isolation -e . -q 2>&1 | tail -1
python3 -m lab.chunk_prep_cuda --cells 4/8:ragged,2/8:ragged,2/4:1x300 --oracle --reps 5 2>&1 | grep -v -i warn | tee $OUT/prep_check.log
python3 -m lab.chunk_prep_cuda --cells 4/8:1x8192,16/32:1x8192,16/32:8x1024,16/64:8x1024,4/8:64x64 --reps 20 2>&1 | grep -v -i warn | tee $OUT/prep_time.log
