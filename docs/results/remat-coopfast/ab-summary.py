import sys,glob,re,statistics as st,collections
out=sys.argv[1]
files=collections.defaultdict(list)
for f in glob.glob(out+'/*.txt'):
    files[f.split('/')[-1].rsplit('.',2)[0]].append(f)
for name,fs in sorted(files.items()):
    data=collections.defaultdict(lambda: collections.defaultdict(list))
    ev={}
    for f in fs:
        model=None
        for l in open(f):
            if l.endswith('.remat.gz\n'): model=l.split('/')[-1].split('.')[0]
            m=re.match(r'\| (0\.\d+) \| ([\d.]+) \| ([\d.]+) \| [\d.]+× \| (\d+) \|',l)
            if m:
                data[model][m[1]].append((float(m[2]),float(m[3])))
                ev[(model,m[1])]=m[4]
    for model,rs in data.items():
        ratios=[]; cs=[]
        for r,v in rs.items():
            c=st.median(x[0] for x in v); d=st.median(x[1] for x in v)
            ratios.append(d/c); cs.append(c)
        print(f"{name:10s} {model:9s} runs {len(fs)} median DTR/Coop {st.median(ratios):.2f}x  per-ratio "+" ".join(f"{x:.1f}" for x in ratios)+f" | coop us "+" ".join(f"{x:.2f}" for x in cs))
