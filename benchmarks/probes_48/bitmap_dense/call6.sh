cd .probe/bm3 && export PYTHONPATH=$PWD/../..:$PWD
NCU=/usr/local/cuda/bin/ncu
timeout 200 $NCU --set full --import-source no -k regex:bitmap_linear_kernel -o $OUT/prof python3 prof2.py > $OUT/ncu_run.log 2>&1; tail -5 $OUT/ncu_run.log
$NCU -i $OUT/prof.ncu-rep --page details --csv > $OUT/details.csv 2>&1; wc -l $OUT/details.csv
timeout 100 $NCU -i $OUT/prof.ncu-rep --page source --csv --print-source sass > $OUT/source.csv 2> $OUT/source.err; wc -c $OUT/source.csv; head -c 600 $OUT/source.err
gzip -f $OUT/source.csv
