set terminal pngcairo size 800,500
set output '--metrics-out='
set xlabel 'step'
set ylabel 'loss (nats)'
set title 'loom_train' noenhanced
set grid
plot '--metrics-out=.dat' using 1:2 with lines title 'loss', 3.169958027936633 with lines dashtype 2 title 'unigram entropy of the data'
