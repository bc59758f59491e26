# bench-report.gp: the report's chart (scripts/bench-report.sh). Each
# scenario's headline, every broker relative to ferrymq (= 1), oriented so
# that higher is better; log scale.
# gnuplot -e "datafile='chart.dat'; outfile='chart.png'" scripts/bench-report.gp
set terminal pngcairo size 1200,520 font "sans,10"
set output outfile
set title "ferrymq vs peers: each scenario's headline relative to ferrymq (= 1; higher is better, log scale)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set logscale y 2
set yrange [0.01:100]
set ytics ("1/64" 0.015625, "1/16" 0.0625, "1/4" 0.25, "1" 1, "4" 4, "16" 16, "64" 64)
set grid ytics
set key outside right top
set xtics rotate by -25 noenhanced
set arrow from graph 0, first 1 to graph 1, first 1 nohead lw 2 dt 2 lc rgb "#444444"
cols = system("head -n 1 ".datafile." | wc -w") + 0
plot for [i=2:cols] datafile using i:xtic(1) title columnheader(i)
